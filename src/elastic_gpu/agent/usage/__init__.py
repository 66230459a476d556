"""Observed usage (issue 28): sample the cards, map processes to pod containers, publish
`status.usage` within the rate limit, report containers above their memory share."""
