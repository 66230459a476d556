pytest_plugins = ["elastic_gpu.devcluster.pytest_plugin"]
