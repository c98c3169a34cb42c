"""`python -m gateway` runs the `mcp-gateway` command."""

from gateway.cli.main import main

main()
