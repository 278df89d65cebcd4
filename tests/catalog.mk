# catalog tests (none yet)
