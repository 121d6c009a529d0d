"""Reading finished runs and sweeps, and the tables, figures and reports made from them."""
