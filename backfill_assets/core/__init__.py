"""Bottom layer: identities, records, the rubric and output gate, outcomes, budgets, prices,
regions. Imports nothing else of the package.
"""
