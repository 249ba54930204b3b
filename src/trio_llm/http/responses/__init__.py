"""POST /v1/responses, GET and DELETE /v1/responses/{id}: protocol.py (wire types), plan.py
(request -> ResponsesPlan), build.py (outputs -> the response and its events), store.py (the
stored responses), endpoint.py (the handlers)."""
