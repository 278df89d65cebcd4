# unit_record tests (none yet)
