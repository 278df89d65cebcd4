# libdcpload and dcpload: the MPI collective loader (empty for now)
