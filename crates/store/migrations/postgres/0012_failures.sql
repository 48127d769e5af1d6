-- Failures with their cause (DESIGN §7, issue "operate a fleet"): an entry into an
-- error-health state records an error of kind `failure`; `cause` names, as JSON, the
-- entities whose states caused it (the successors a subscription matched), so "why did
-- this fail" is read down to the first cause.
ALTER TABLE errors ADD COLUMN cause TEXT;
