"""The ops database: models, engine and units of work, migrations (DESIGN.md "Architecture")."""
