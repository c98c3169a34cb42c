"""The upstream side: one supervised MCP session per server, how it is started, listed, probed and torn down."""
