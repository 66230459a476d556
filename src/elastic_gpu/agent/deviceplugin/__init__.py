"""The device-plugin node mode: GPUDevice objects for the scheduler extender, one kubelet
device plugin per advertised resource (`node.DevicePluginNode`)."""
