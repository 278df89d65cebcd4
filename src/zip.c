/* STUB: replaced by the zip reader. */
#include "internal.h"
#include "zip.h"
