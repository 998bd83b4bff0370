"""Admission: the AdmissionReview envelope, one handler per webhook, the path table."""
