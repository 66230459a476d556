pytest_plugins = ["egpu_testing.pytest_plugin"]
