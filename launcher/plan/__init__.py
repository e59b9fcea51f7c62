"""Pure: options, environment and host facts in; what to start, and what each event means, out."""
