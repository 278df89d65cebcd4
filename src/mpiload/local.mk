# libdcpload and dcpload (issue 6)
