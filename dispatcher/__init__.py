"""The dispatcher: the only writer of session state."""
