"""Generated protobuf modules for the kubelet pod-resources API (see podresources.proto)."""
