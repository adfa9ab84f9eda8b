"""On-demand traces in agentd: Kineto captures through the IPC endpoint, timeline dumps, file fetch."""
