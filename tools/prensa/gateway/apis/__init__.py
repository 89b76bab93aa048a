"""The API dialects the gateway speaks, one folder each (protocol: the dialect's own bodies and
answers, pydantic only; routes: its operations, each reading a body into an ask and rendering the
answer in its vendor's shape). `shared` is the route table of the paths several dialects share,
`dialects` the rule that tells their bodies apart by their fields (for the bodies and the error
handlers alike); `operation`, `common`, `answers` and `errors` are what dialects share."""
