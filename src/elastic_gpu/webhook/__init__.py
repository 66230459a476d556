"""The admission webhook (`egpu webhook`): an HTTPS AdmissionReview server over core.admission."""
