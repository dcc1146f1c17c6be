"""The backend contract (the Backend ABC and its verbs) and what backend authors share."""
