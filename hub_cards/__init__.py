"""Model card templates rendered by the converters."""
