"""The Slack app: keep / release buttons on warnings and the endpoint that answers their clicks."""
