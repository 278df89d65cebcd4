# writer tests (none yet)
