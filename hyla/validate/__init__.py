"""`hyla validate MODEL`: the day-one acceptance checklist as one command (see `runner`)."""
