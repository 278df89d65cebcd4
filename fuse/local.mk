# dcpfs: the FUSE driver (empty for now)
