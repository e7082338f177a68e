"""Protobuf and gRPC modules generated from protos/ by tools/gen_protos.py."""
