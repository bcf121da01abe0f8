"""Process start-up of both roles: the one part of ``lensemble.network`` importing both sides."""
