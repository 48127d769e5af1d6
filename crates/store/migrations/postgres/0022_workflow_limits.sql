-- Limits of workflows (DESIGN §10): a hold or a place in line is for the workflow a queued
-- event starts (`workflow` 1: held until the entity comes to rest) or for an auto action
-- (0: given back by the commit that ends it).
ALTER TABLE limit_holds ADD COLUMN workflow BIGINT NOT NULL DEFAULT 0;
ALTER TABLE limit_waiters ADD COLUMN workflow BIGINT NOT NULL DEFAULT 0;
