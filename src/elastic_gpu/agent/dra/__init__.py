"""The agent in DRA mode (`dra.enabled` in its config): its cards published as ResourceSlices
(`slices_api`) and the kubelet's DRA plugin service. The shapes are `core.dra`'s."""
