"""One module per subcommand (see rlhf_exporter/cli.py)."""
