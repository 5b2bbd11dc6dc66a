"""The `lightpipe` command line: one module per subcommand, registered in main.py."""
