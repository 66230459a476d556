"""The mutators, one module per feature that owns one (see `core.admission.mutation`)."""
