"""The `mesh` command's exit codes, shared by every command module."""

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3
