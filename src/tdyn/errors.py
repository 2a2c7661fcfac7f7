"""User-facing errors: the CLI prints their message on one line and exits with status 2."""


class UserError(Exception):
    """A mistake in the user's input (config, arguments, paths). Printed without a traceback."""


class ConfigError(UserError):
    """A config key has a bad value; the message names the key, the value and what is allowed."""
