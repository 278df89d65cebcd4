# unit_planner tests (none yet)
