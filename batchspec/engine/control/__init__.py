"""Adaptive speculation: how many drafts each row gets in a round, decided from what drafts are worth
(acceptance_model.py; a lookup's also learnt from the drafts it proposed and nobody verified, hindsight.py)
and what they cost on this machine (costs.py, line.py, startup_costs.py, round_prices.py), chosen per row
(row_drafts.py, packed_choice.py) and checked against the wall clock (payoff.py). adaptive.py is the
controller the Scheduler asks; the choice never changes a greedy output."""
