"""python3 -m hybridserve_gateway: the gateway binary (main.main)."""

from hybridserve_gateway.main import main

if __name__ == "__main__":
    main()
