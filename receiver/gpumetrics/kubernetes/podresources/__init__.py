"""The kubelet's pod-resources API messages (generated code in :mod:`.v1`)."""
