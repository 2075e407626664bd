"""`hyla plan`: capacity planning from config.json alone (see `hyla.plan.planner`)."""
