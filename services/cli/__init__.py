"""The `tailrace` command: local runs (`up`, `demo`) and, over gRPC, the admin client."""
