"""The paths a results bundle records, relative to the repository: a bundle is committed and read on other machines.

``campaign.json`` keeps the command that made the campaign. As typed it holds the paths of the machine
it ran on (``/root/.cache/mtl_cog/lanes/NAME/code/scripts/reproduce.py --out /root/.cache/...``); as
recorded, a path inside the code (the checkout, or a lane's frozen copy of it) or inside the lane's
checkout (``MTL_COG_REPO``, set by ``mtl-cog lane``) is relative to it, and the campaign's own output
folder is ``<out>``, so the record is the same on every machine and names no one's home.
"""

from __future__ import annotations

import os
from pathlib import Path

from mtl_cog.experiments.launcher import PACKAGE_PARENT

OUT = "<out>"  # the campaign's output folder (where its bundle is), in a recorded command
REPO_ENV = "MTL_COG_REPO"  # the checkout a lane commits to (its code runs from a frozen copy elsewhere)


def portable_path(text: str, out: Path | None = None) -> str:
    """``text`` relative to the code or the lane's checkout when it is an absolute path inside one; the
    campaign's output folder as ``<out>``; anything else unchanged."""
    if not os.path.isabs(text):
        return text
    path = Path(text).resolve()  # links and ".." as the file system reads them
    if out is not None and path.is_relative_to(Path(out).resolve()):
        inside = path.relative_to(Path(out).resolve())
        return OUT if inside == Path() else str(Path(OUT) / inside)
    for root in (PACKAGE_PARENT, os.environ.get(REPO_ENV)):
        if root and path.is_relative_to(Path(root).resolve()):
            return str(path.relative_to(Path(root).resolve())) or "."
    return text


def portable_command(command: list[str], out: Path | None = None) -> list[str]:
    """A campaign's command line as ``campaign.json`` records it (``--flag=/path`` forms included)."""
    words = []
    for word in command:
        if word.startswith("--") and "=" in word:
            flag, value = word.split("=", 1)
            words.append(f"{flag}={portable_path(value, out)}")
        else:
            words.append(portable_path(word, out))
    return words
