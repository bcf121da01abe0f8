"""Generated protobuf and gRPC stubs of ``lensemble.proto`` (package ``lensemble.v1``)."""
