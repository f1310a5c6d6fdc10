"""Bad input a user gave: a command's argument, a file, a value out of range (exit 2)."""


class UserError(ValueError):
    """Bad input from the command line or a file it names (exit 2, the message says which)."""
