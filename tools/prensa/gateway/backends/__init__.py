"""What answers the core's calls: Triton over gRPC, Triton's replicas behind one client, or the
stage code in this process (tests, `prensa serve --in-process`), all behind `base.Backend`."""
