# unit_pickle tests (none yet)
