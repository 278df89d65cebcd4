# core tests (none yet)
