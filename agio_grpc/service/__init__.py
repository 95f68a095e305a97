"""The gRPC edge: servicers, proto <-> domain conversion, error mapping, interceptors and the
server bootstrap. The only layer that imports grpc; nothing imports it back."""
