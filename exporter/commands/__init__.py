"""One module per subcommand (see exporter/cli.py)."""
