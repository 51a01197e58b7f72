"""Entry point of //gateway:gateway (the Bazel-built binary); installed, the
same is `hybridserve-gateway` or `python3 -m hybridserve_gateway`."""

from hybridserve_gateway.main import main

if __name__ == "__main__":
    main()
