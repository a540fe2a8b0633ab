"""Numbers to tables and plots; no computation here."""
