# load tests (none yet)
