# fuse tests (none yet)
