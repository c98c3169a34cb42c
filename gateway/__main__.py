"""`python -m gateway` runs the `mcp-gateway` command."""

from gateway.cli import main

main()
