"""What says a file changed on disk (its mtime, size and inode: an editor's rename-into-place
changes the inode), for the processes that read a file again when it changes: the
dispatcher's signing keys (dispatcher/keys_reload.py), the inbox's users and keys files
(parley/web/files.py)."""

import os

#: (mtime ns, size, inode); None when the file could not be stat'ed
Stamp = tuple[int, int, int] | None


def stamp_of(path: str) -> Stamp:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino
