/* STUB header: replaced by the zip reader. */
#ifndef DCP_ZIP_H
#define DCP_ZIP_H
#endif
