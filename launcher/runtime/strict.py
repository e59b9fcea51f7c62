"""Option objects that refuse attributes they do not have, naming the nearest (a typo never passes silently)."""

import difflib
from dataclasses import fields


def refuse_unknown(obj, name: str, extra: tuple = (), what: str = None,
                   family: str = "Paddle 1.8's collective strategy") -> None:
    """AttributeError for an option ``obj`` does not have, naming the valid ones and the nearest."""
    known = [f.name for f in fields(obj)] + list(extra)
    if name in known:
        return
    near = difflib.get_close_matches(name, known, n=1)
    hint = f" Did you mean {near[0]!r}?" if near else ""
    raise AttributeError(f"{what or type(obj).__name__} has no option {name!r}: only the options of {family} "
                         f"have a meaning on PyTorch ({', '.join(known)}).{hint}")
