"""The pure domain: work, the policy, money and the checks. Imports nothing else of the
package, and neither Dagster, SQLAlchemy nor httpx."""
